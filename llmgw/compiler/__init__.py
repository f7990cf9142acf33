"""The compiler: catalogue files and a fleet inventory in, findings and a resolved plan out.

Its stages, in the order a model file meets them:

    catalogue.py     a model file read and checked into a typed model, with its sources
    source.py        what a `source:` names (hf://, a path, a URL) and its weight format
    gguf_header.py   a GGUF file's header, read with a bounded reader; fetch.py gets it remotely
    validate.py      JSON Schema and pydantic, findings at file:line:column
    memory.py        one replica's memory figure (declared, sized by its engine, or rough)
    capacity.py      what each node holds; place.py puts replicas on nodes
    rules/           the lint rules, one module per family; keys.py lints keys.yaml
    lint.py          every stage above, into findings; build.py the plan from them
    inspect.py       `llmgw inspect`: a source's facts

It imports the shared modules beneath it (model, schema, load, plan, engines) and never the
gateway, the node agent or the GitOps tools: what they need is in the plan it writes.
"""
