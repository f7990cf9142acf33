"""What a pull request and a deploy see: the plan diff and its reporters, the fleet inventory,
Gitea's API, and `llmgw deploy`'s client of a running gateway.

    diff.py          two plans → what changed, per model and replica
    report/          findings, diffs, inspections and statuses as text, json, github or markdown
    inventory.py     `llmgw inventory`: a node's memory and engines, written as fleet.yaml
    gitea.py         the pull-request comment and check
    deploy.py        hands a plan to a running gateway's /admin

These read plans and findings; the compiler and the gateway never import them.
"""
