"""Plan → another orchestrator's files. Renderers read only the plan, as the gateway does:
what they need was decided by `llmgw plan`, and the compiler's stages are not imported."""
