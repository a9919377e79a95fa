"""astraflow.actors"""
