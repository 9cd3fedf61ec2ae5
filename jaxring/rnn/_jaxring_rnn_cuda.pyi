FORWARD_TARGET: str = 'jaxring_persistent_rnn_forward'

BACKWARD_TARGET: str = 'jaxring_persistent_rnn_backward'

THREADS_PER_BLOCK: int = 512

def shared_bytes(directions: int, batch: int, hidden: int, gates: int, unit_groups: int, batch_rows: int, forward_chunk: int, backward_chunk: int, storage_bytes: int) -> tuple: ...

def registrations() -> dict: ...

def device_budget(ordinal: int) -> dict: ...
