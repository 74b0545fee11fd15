package admin

import (
	"errors"
	"fmt"
	"net/http"
	"sort"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/saga"
)

// Sagas lists the machines whose instances the handler shows under
// /sagas (read-only). Their tables are read on the bus's database
// (b.DB()). An instance is shown as its JSON encoding: saga.State's fields
// and the model's own; hide a field with the tag json:"-".
func Sagas(machines ...saga.Inspector) Option {
	return func(c *config) {
		for _, m := range machines {
			if m != nil {
				c.sagas = append(c.sagas, m)
			}
		}
	}
}

type sagaView struct {
	Name   string                   `json:"name"`
	Table  string                   `json:"table"`
	States map[saga.StateName]int64 `json:"states"`
	Total  int64                    `json:"total"`
}

// machine finds the machine named in the path, or answers 404 or 503.
func (a *handler) machine(w http.ResponseWriter, r *http.Request) (saga.Inspector, bool) {
	if a.b.DB() == nil {
		writeError(w, http.StatusServiceUnavailable, bus.ErrNotStarted)
		return nil, false
	}
	name := r.PathValue("machine")
	for _, m := range a.cfg.sagas {
		if m.Name() == name {
			return m, true
		}
	}
	writeError(w, http.StatusNotFound, fmt.Errorf("saga %q is not shown here; GET /sagas lists those given to admin.Sagas", name))
	return nil, false
}

func (a *handler) sagas(w http.ResponseWriter, r *http.Request) {
	if a.b.DB() == nil {
		writeError(w, http.StatusServiceUnavailable, bus.ErrNotStarted)
		return
	}
	out := make([]sagaView, 0, len(a.cfg.sagas))
	for _, m := range a.cfg.sagas {
		counts, err := m.CountByState(r.Context(), a.b.DB())
		if err != nil {
			writeError(w, http.StatusInternalServerError, err)
			return
		}
		v := sagaView{Name: m.Name(), Table: m.Table(), States: counts}
		for _, n := range counts {
			v.Total += n
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	writeJSON(w, http.StatusOK, map[string]any{"sagas": out})
}

func (a *handler) sagaList(w http.ResponseWriter, r *http.Request) {
	m, ok := a.machine(w, r)
	if !ok {
		return
	}
	limit, err := queryInt(r, "limit", defaultLimit, 1, maxLimit)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	state := r.URL.Query().Get("state")
	if len(state) > saga.MaxStateNameLen {
		writeError(w, http.StatusBadRequest, fmt.Errorf("state=%q: a state name has at most %d characters", state, saga.MaxStateNameLen))
		return
	}
	insts, err := m.ListInstances(r.Context(), a.b.DB(), saga.StateName(state), limit)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	// Least recently changed first: the instances stuck longest.
	writeJSON(w, http.StatusOK, map[string]any{"saga": m.Name(), "state": state, "limit": limit, "instances": insts})
}

func (a *handler) sagaShow(w http.ResponseWriter, r *http.Request) {
	m, ok := a.machine(w, r)
	if !ok {
		return
	}
	inst, err := m.GetInstance(r.Context(), a.b.DB(), r.PathValue("id"))
	switch {
	case errors.Is(err, saga.ErrNotFound):
		writeError(w, http.StatusNotFound, fmt.Errorf("%w (finalized instances are deleted unless the machine keeps them)", err))
	case err != nil:
		writeError(w, http.StatusInternalServerError, err)
	default:
		writeJSON(w, http.StatusOK, inst)
	}
}
