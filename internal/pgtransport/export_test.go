package pgtransport

// SetServerVersionNum makes t take num for the server's
// server_version_num instead of asking it. Call it before Start.
func (t *Transport) SetServerVersionNum(num int) { t.versionNum = num }
