"""Starting and watching ranks: the door checks, placement, allocator, interfaces, lifetime, failures."""
