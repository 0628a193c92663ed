"""Backbones: loading a transformer and its tokenizer (``loading``), the bundled offline models
(``bundled``), telling decoders from encoders and refusing models lmembed cannot run (``families``), and
switching a decoder between causal and bidirectional attention (``attention``)."""
