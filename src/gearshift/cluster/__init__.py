"""gearshift.cluster"""
