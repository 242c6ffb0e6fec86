"""gearshift.report"""
