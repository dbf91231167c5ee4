"""The pure core: functions over values. No aiohttp, no database, no clock, no I/O."""
