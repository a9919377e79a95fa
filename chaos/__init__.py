"""astraflow.chaos"""
