"""encoding"""
