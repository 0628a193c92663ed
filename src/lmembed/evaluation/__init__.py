"""Evaluation: MTEB-style tasks, metrics, results files and reports.

* :mod:`~lmembed.evaluation.base`: the :class:`~lmembed.evaluation.base.Task` protocol every task
  type implements, and the :class:`~lmembed.evaluation.base.TaskResult` it produces;
* :mod:`~lmembed.evaluation.tasks`: the task types (retrieval, reranking, STS, classification,
  clustering, pair classification, summarization), loading a task from data, and the retrieval
  subsampler; :mod:`~lmembed.evaluation.retrieval_data`, :mod:`~lmembed.evaluation.search` and
  :mod:`~lmembed.evaluation.metrics`: reading BEIR splits, exact search, pytrec_eval metrics;
* :mod:`~lmembed.evaluation.suites`: named suites, locating known tasks under a data root, loading a
  task by name, and MTEB's aggregation; :mod:`~lmembed.evaluation.instructions`: task instructions;
* :mod:`~lmembed.evaluation.runner`: many strategies × many tasks, sharing forward passes;
  :mod:`~lmembed.evaluation.main_job` and :mod:`~lmembed.evaluation.sweep`: what ``lmembed eval``
  and ``lmembed sweep`` run;
* :mod:`~lmembed.evaluation.results` and :mod:`~lmembed.evaluation.report`: MTEB-layout result
  files and the tables and charts made from them; :mod:`~lmembed.evaluation.mteb_adapter`: running
  the ``mteb`` package on an lmembed encoder.

The facts of each known MTEB task (type, data location, split, settings, instruction) live in one
place, :mod:`lmembed.task_registry`. Adding a dataset: one ``TaskSpec`` entry in
``lmembed.task_registry``.
"""
