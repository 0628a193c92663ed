"""Training data made and cleaned the way the seed papers' best models get it.

=================== =====================================================================================
module              holds
=================== =====================================================================================
``decontaminate``   dropping training rows that repeat evaluation items (exact, n-gram, near-duplicate,
                    relative BM25), with a report of every drop and its reason
``eval_texts``      the texts of named evaluation sets that training must not repeat
=================== =====================================================================================
"""
