"""A Megatron-style 3D-parallel job, simulated: real-format NCCL dumps with known ground truth."""
