"""The node agent: runs the engines a plan places on this machine. Reads only the plan.

run        `llmgw node`: the agent's process, its status and control endpoints
sources    where the plan comes from: a file here, or a gateway's /admin/plan
agent      reconciliation: a new plan against the running replicas
runner     one replica's life: weights, start, health, backoff, idle
demand     on-demand replicas: acquire and release, making room by memory, idle stops
process    engine processes and the records that let a restarted agent adopt them
weights    a replica's weights, downloaded or found
host       what the machine has: a free port, the memory free now
status     `llmgw node status`: the agent's status as a table
"""
