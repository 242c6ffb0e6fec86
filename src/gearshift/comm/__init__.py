"""gearshift.comm"""
