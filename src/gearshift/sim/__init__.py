"""gearshift.sim"""
