"""Who a rank is and how it joins: world, process groups and RPC, preemption, thread shares."""
