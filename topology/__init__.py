"""astraflow.topology"""
