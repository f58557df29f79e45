"""Sweeps over model zoos and families (torchvision, timm, the seeds' networks) and parity with zennit."""
