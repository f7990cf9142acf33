"""What changes under the requests: the served plan, discovery, health, keys, outliers, rates, metrics."""
