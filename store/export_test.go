package store

// Subscribers returns the number of live subscriptions, for tests.
func (m *Memory) Subscribers() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, set := range m.subs {
		n += len(set)
	}
	return n
}

// Stored returns the number of entries held, expired or not, without
// sweeping, for tests.
func (m *Memory) Stored() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.m)
}
