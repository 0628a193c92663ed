"""Experiments: a grid of arms × seeds, each trained (or not) and evaluated, with differences judged.

An experiment file (YAML) names a base model, shared training settings, **arms** (a strategy, a training
run, or a recipe), **seeds** and an evaluation suite. ``lmembed experiment FILE.yaml`` trains and evaluates
every (arm, seed) once, in one results folder, resumable after an interruption.

* :mod:`~lmembed.experiments.spec`: reading and checking the file (errors name the file and line);
* :mod:`~lmembed.experiments.plan`: the runs an experiment consists of, and which are finished;
* :mod:`~lmembed.experiments.scoring`: evaluating one model on the suite, keeping per-item scores (any task
  type: what it embeds, how it shrinks and its items come from the task's protocol);
* :mod:`~lmembed.experiments.execute`: one run (training through the recipes or the trainer, then scoring);
* :mod:`~lmembed.experiments.runner`: running the plan, one run after another or within a time budget;
* :mod:`~lmembed.experiments.parallel`: running it on several worker processes (``--workers``);
* :mod:`~lmembed.experiments.stats`: mean ± std over seeds, paired bootstrap intervals and randomization
  tests between arms, and the verdicts;
* :mod:`~lmembed.experiments.summary`: the summary (JSON) built from the finished runs;
* :mod:`~lmembed.experiments.report`: its Markdown and PNG, and ``lmembed report`` on any folder.
"""
