"""Evaluation: MTEB-style tasks, metrics, results files and reports."""
