"""What runs inside a node's workers: the persistent worker's loop (host), and the frames it speaks with its agent."""
