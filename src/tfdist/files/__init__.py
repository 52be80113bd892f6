"""Files a stage leaves: written whole or not at all, under locks, in folders only their owner enters, and a full or
read-only disk told in one line."""
