"""astraflow.workflows"""
