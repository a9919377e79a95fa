"""The tiny bootstrapped models: a policy per role, built here, with nothing downloaded.

* :mod:`.char_tokenizer` — the character tokenizer they share;
* :mod:`.warm_start` — what each role's model is supervised on before RL (the task
  registry: ``arithmetic``, ``verifier``, the code roles), built from the workflows' formats;
* :mod:`.spec` — what a tiny model is (architecture, schedule) and its cache key;
* :mod:`.measure` — a model's score on a warm-start task's distinct examples;
* :mod:`.target` — whether a build met its warm-start target, and the warning when not;
* :mod:`.build` — one build: a Qwen3 model warm-started on a task, saved as an HF directory;
* :mod:`.bootstrap` — ``resolve_model_path`` (a job's model directory, configured or the
  cached tiny one), the cache (``ensure_tiny_model``) and the model's shape.

``astraflow model init|info`` is the CLI's (:mod:`astraflow.cli.model`).

It sits above the engines (it trains with torch and measures with the CPU engine) and the
workflows (whose prompt formats the roles learn), below the components that load it.
"""
