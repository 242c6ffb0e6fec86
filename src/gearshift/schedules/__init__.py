"""gearshift.schedules"""
