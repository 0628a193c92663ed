"""Training data made and cleaned the way the seed papers' best models get it.

=================== =====================================================================================
module              holds
=================== =====================================================================================
``decontaminate``   dropping training rows that repeat evaluation items (exact, n-gram, near-duplicate,
                    relative BM25), with a report of every drop and its reason
``eval_texts``      the texts of named evaluation sets that training must not repeat
``generators``      one interface to a local transformers LM, an OpenAI-compatible endpoint, a tiny stand-in
``parsing``         strict reading of generated JSON: repaired where safe, else rejected with a reason
``recipes``         synthesis recipes as YAML files (prompts, knobs), with their provenance
``runner``          sharded, resumable runs: atomic shards, progress (rows/s, acceptance, ETA), stats; the
                    shards run in this process or on an engine handed in (``lmembed.scale``'s Ray engine)
``e5_mistral``      E5-mistral's brainstorm-then-generate recipe
``gecko``           Gecko's FRet: generate, retrieve, relabel (query likelihood + relevance, RRF)
``corpus_only``     queries from a user's corpus, round-trip filtered, mined negatives, teacher scores
``retrieval``       the seed corpus embedded once per run, top-k search over it, an embedder by name that
                    travels to Ray workers
``synthesize``      the Python API of ``lmembed synthesize``
=================== =====================================================================================
"""
