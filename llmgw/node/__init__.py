"""The node agent: runs the engines a plan places on this machine. Reads only the plan.

run        `llmgw node`: the agent's process, its status and control endpoints
sources    where the plan comes from: a file here, or a gateway's /admin/plan
agent      reconciliation: a new plan against the running replicas
runner     one replica's life: weights, start, health, backoff, idle
leases     on-demand replicas: acquire and release, making room by memory, idle stops
process    engine processes and the records that let a restarted agent adopt them
weights    a replica's weights, downloaded or found
host       what the machine has: a free port, the memory free now
status     the agent's HTTP face: /status, /metrics, and /acquire and /release for the gateway
"""
