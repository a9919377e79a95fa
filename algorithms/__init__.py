"""astraflow.algorithms"""
