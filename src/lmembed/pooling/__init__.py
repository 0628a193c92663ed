"""Reading vectors out of hidden states: which layers (``layers``), the stateless poolers (``poolers``),
NV-Embed's trainable latent-attention head (``latent_attention``) and a published model's post-pooling
Dense/LayerNorm/Normalize layers (``head``)."""
