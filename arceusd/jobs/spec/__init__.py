"""The job spec: what a user submits, read, bounded and identified. Pure and torch-free; imports nothing else of
``arceusd.jobs``.

- :mod:`~arceusd.jobs.spec.schema`: the schema and the entry points (:func:`load_spec`, :func:`parse_spec`,
  :func:`spec_from_dict`); its docstring lists the fields;
- :mod:`~arceusd.jobs.spec.parser`: every field of a parsed TOML/JSON document read, bounded and validated;
- :mod:`~arceusd.jobs.spec.parsed`: the parsed spec, frozen dataclasses only (:class:`JobSpec`);
- :mod:`~arceusd.jobs.spec.identity`: the canonical form, the spec hash and a job's id;
- :mod:`~arceusd.jobs.spec.hf`: the fields of a stock ``transformers`` causal LM (``[model] type = "hf"``);
- :mod:`~arceusd.jobs.spec.lora`: the ``[lora]`` section (adapters on a frozen stock LM);
- :mod:`~arceusd.jobs.spec.fields`: the problem-collecting reader of single fields;
- :mod:`~arceusd.jobs.spec.datafacts`: what a spec needs to know of its data files, read cheaply.
"""
