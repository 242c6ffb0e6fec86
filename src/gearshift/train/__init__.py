"""gearshift.train"""
