"""What runs inside the user's training process: the bootstrap, exit hooks, role, identity, steps, stacks, failures."""
