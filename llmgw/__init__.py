"""llmgw: a fleet of self-hosted LLMs behind one OpenAI-compatible endpoint.

The catalogue (one YAML file per model) is compiled against a fleet inventory
into a resolved plan; the gateway reads only the plan.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
