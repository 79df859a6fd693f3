"""What claims would get, before anything is applied: the structured-parameters allocator
(DeviceClass and request CEL, counts, shared counters, consumable capacity) and the
`describe --claims` what-if built on it and on the driver's core. The scheduler double in
`emulator` and the DRA demo use the same allocator."""
