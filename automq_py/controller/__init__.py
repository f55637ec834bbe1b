"""The controller role of a cluster: membership, partition placement, failover and leader
balance as pure planners over the metadata image; the lease that makes one broker at a time
the controller.
"""
