"""Who takes part: the population's device profiles (Zipf compute and bandwidth), sampling each round's
clients, planned dropout, and availability replayed from traces. Driver-neutral: the runner plans rounds
with it, and both drivers read the same profiles."""
