"""Reading vectors out of hidden states: which layers (``layers``), the stateless poolers (``poolers``)
and NV-Embed's trainable latent-attention head (``latent_attention``)."""
