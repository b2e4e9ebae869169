"""Background maintenance: lease and deadline reapers, retry promotion. Status changes only
through ``transition_task``."""
