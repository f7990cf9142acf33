"""What changes under the requests: the served plan, the route table, discovery, health, keys,
what is loaded where, outliers, rates, metrics."""
