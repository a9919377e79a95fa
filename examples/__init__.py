"""astraflow.examples"""
