"""gearshift.models"""
