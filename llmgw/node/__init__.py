"""The node agent: runs the engines a plan places on this machine. Reads only the plan."""
