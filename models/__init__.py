"""The tiny bootstrapped models: a policy per role, built here, with nothing downloaded.

* :mod:`.char_tokenizer` — the character tokenizer they share;
* :mod:`.warm_start` — what each role's model is supervised on before RL (the task
  registry: ``arithmetic``, ``verifier``, the code roles), built from the workflows' formats;
* :mod:`.bootstrap` — the build, its cache and ``astraflow model init|info``, and
  ``resolve_model_path``: a job's model directory, configured or the cached tiny one.

It sits above the engines (it trains with torch and measures with the CPU engine) and the
workflows (whose prompt formats the roles learn), below the components that load it.
"""
