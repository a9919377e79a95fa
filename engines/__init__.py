"""astraflow.engines"""
