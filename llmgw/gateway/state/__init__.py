"""What changes under the requests: the served plan, the route table, discovery, health, keys,
outliers, rates, metrics."""
