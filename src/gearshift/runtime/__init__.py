"""gearshift.runtime"""
