"""Training: contrastive fine-tuning, pre-training stages and the recipes that chain them.

======================= ==========================================================================
module                  holds
======================= ==========================================================================
:mod:`.trainer`         ``Trainer``, ``TrainResult``: the contrastive training loop and checkpoints
:mod:`.train_config`    ``TrainConfig`` (contrastive runs), ``ObjectiveConfig`` (stages), shared options
:mod:`.trainable`       ``TrainableEmbedder``, ``build_trainable``, ``LoraSettings``: the model side
:mod:`.data`            training rows, data sources and the batch samplers
:mod:`.converters`      labelled datasets (BEIR, classification, STS ...) turned into training rows
:mod:`.losses`          loss functions and ``build_training_loss`` (a config's loss)
:mod:`.reranker`        ``TrainableReranker``: a cross-encoder or LLM reranker trained by the trainer (``reranker``)
:mod:`.stages`          pre-training stages: MNTP, SimCSE, Anchor stage I, AnglE pairs
:mod:`.recipes`         YAML recipes: data preparation and a sequence of stages
:mod:`.optim`           AdamW, the warm-up/decay schedule and ``OptimisationStep`` (shared by all loops)
:mod:`.gradcache`       ``GradCache``: large contrastive batches in bounded memory
:mod:`.distributed`     ``setup_distributed``, ``DistContext``, the cross-process gather for losses, FSDP2 sharding
:mod:`.checkpoint`      crash-safe checkpoints and RNG state for exact resumption
:mod:`.metrics_log`     ``metrics.jsonl``, the loss-curve PNG and the progress bar
:mod:`.dev_eval`        nDCG@10 on dev retrieval sets during training
:mod:`.seeding`         ``set_seed``
======================= ==========================================================================

Importing this package imports nothing else; the modules above are imported on their own.
"""
