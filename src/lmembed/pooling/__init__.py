"""pooling"""
