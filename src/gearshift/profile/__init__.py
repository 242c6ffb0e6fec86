"""gearshift.profile"""
