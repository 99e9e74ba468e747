// A minimal Go stdlib admission server doing the same whole-card rewrite as /mutate-pods, used
// only as the speed reference of bench/run.sh (net/http + crypto/tls, no modules). Its validating
// paths decode the review and allow it: in bench/apiserver_overhead.py they stand for the cheapest
// possible validating webhook, so the run shows what the apiserver alone spends on the second call.
package main

import (
	"encoding/base64"
	"encoding/json"
	"flag"
	"log"
	"net/http"
	"strconv"
	"strings"
)

type review struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Request    json.RawMessage `json:"request,omitempty"`
	Response   *response       `json:"response,omitempty"`
}

type request struct {
	UID    string `json:"uid"`
	Object struct {
		Spec struct {
			Containers []struct {
				Resources struct {
					Requests map[string]string `json:"requests"`
					Limits   map[string]string `json:"limits"`
				} `json:"resources"`
			} `json:"containers"`
		} `json:"spec"`
	} `json:"object"`
}

type response struct {
	UID       string `json:"uid"`
	Allowed   bool   `json:"allowed"`
	PatchType string `json:"patchType,omitempty"`
	Patch     string `json:"patch,omitempty"`
}

type op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value string `json:"value,omitempty"`
}

func escape(name string) string {
	return strings.ReplaceAll(strings.ReplaceAll(name, "~", "~0"), "/", "~1")
}

// decode reads the AdmissionReview's request, answering 400 itself when it cannot.
func decode(w http.ResponseWriter, r *http.Request) (request, bool) {
	var in review
	var req request
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 3<<20)).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return req, false
	}
	if err := json.Unmarshal(in.Request, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return req, false
	}
	return req, true
}

func mutate(w http.ResponseWriter, r *http.Request) {
	req, ok := decode(w, r)
	if !ok {
		return
	}
	var ops []op
	for i, c := range req.Object.Spec.Containers {
		for field, list := range map[string]map[string]string{"requests": c.Resources.Requests, "limits": c.Resources.Limits} {
			n, ok := list["nvidia.com/gpu"]
			if !ok {
				continue
			}
			cards, err := strconv.Atoi(n)
			if err != nil {
				continue
			}
			base := "/spec/containers/" + strconv.Itoa(i) + "/resources/" + field + "/"
			v := strconv.Itoa(cards * 100)
			ops = append(ops, op{"remove", base + escape("nvidia.com/gpu"), ""},
				op{"add", base + escape("koordinator.sh/gpu-core"), v},
				op{"add", base + escape("koordinator.sh/gpu-memory-ratio"), v})
		}
	}
	out := review{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview", Response: &response{UID: req.UID, Allowed: true}}
	if len(ops) > 0 {
		patch, _ := json.Marshal(ops)
		out.Response.PatchType = "JSONPatch"
		out.Response.Patch = base64.StdEncoding.EncodeToString(patch)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func allow(w http.ResponseWriter, r *http.Request) {
	req, ok := decode(w, r)
	if !ok {
		return
	}
	out := review{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview", Response: &response{UID: req.UID, Allowed: true}}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:9443", "listen address")
	cert := flag.String("cert", "tls.crt", "certificate")
	key := flag.String("key", "tls.key", "private key")
	flag.Parse()
	http.HandleFunc("/mutate-pods", mutate)
	http.HandleFunc("/validate-pods", allow)
	http.HandleFunc("/validate-elasticquotas", allow)
	log.Fatal(http.ListenAndServeTLS(*addr, *cert, *key, nil))
}
