package redisstore

// Subscribers returns the number of live local subscriptions, for tests.
func (i *Index) Subscribers() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	n := 0
	for _, set := range i.subs {
		n += len(set)
	}
	return n
}
