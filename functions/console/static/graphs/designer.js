// @ts-check
/**
 * The designer: edits one template's designer JSON and saves it as a new inactive version.
 *
 * `design` (the JSON the server speaks: name, stateChoices, nodes, connections) is the one
 * source of truth; Cytoscape only shows it and is redrawn from it after every change. Every
 * action has a form control beside the diagram (add a node, move it by X and Y, connect two
 * nodes chosen in two lists, edit and delete), so the keyboard can do all of it; dragging a
 * node on the diagram moves it too. A save posts the JSON with fetch and shows the
 * validation problems the response names, on the nodes and edges and as a list whose items
 * select what they name.
 */
(function () {
  "use strict";

  const NODE_GAP = 120; // pixels between a new node and the lowest one
  const FIRST_PLACE = { x: 360, y: 60 }; // where the first node goes

  /** @type {any} */
  const diagram = /** @type {any} */ (window).dulyDiagram;
  const data = JSON.parse(byId("designer-data").textContent || "{}");
  /** @type {{name: string, description?: string, stateChoices: string[], baseTemplateId?: string,
   *   forbidSelfApproval?: boolean, submitters?: string, nodes: any[], connections: any[]}} */
  const design = data.design;
  /** @type {any[]} */
  let problems = [];
  /** @type {string|null} */
  let selectedNode = null;
  /** @type {string|null} */
  let selectedEdge = null;

  function byId(/** @type {string} */ id) {
    const found = document.getElementById(id);
    if (!found) throw new Error("the designer page has no #" + id);
    return /** @type {any} */ (found);
  }

  /** The console's CSRF token (a hidden field of the page's forms) as a request header. */
  function csrfHeaders() {
    const token = /** @type {HTMLInputElement|null} */ (document.querySelector('input[name="csrf_token"]'));
    return token ? { "X-CSRF-Token": token.value } : {};
  }

  // -- the diagram --------------------------------------------------------------------------

  const cy = diagram.draw(byId("designer-canvas"), { ...design, preset: data.preset }, { editable: true });
  byId("designer-canvas").cy = cy; // for the browser tests and the curious
  if (!data.preset) {
    // dagre placed the nodes: those places become the design's, saved with it.
    cy.nodes().forEach((/** @type {any} */ element) => placeFromCanvas(element));
  }
  cy.on("dragfree", "node", (/** @type {any} */ event) => {
    placeFromCanvas(event.target);
    if (selectedNode === event.target.id()) showNode();
  });
  cy.on("tap", "node", (/** @type {any} */ event) => selectNode(event.target.id()));
  cy.on("tap", "edge", (/** @type {any} */ event) => selectEdge(event.target.id()));

  function placeFromCanvas(/** @type {any} */ element) {
    const node = nodeOf(element.id());
    if (!node) return;
    node.x = Math.round(element.position("x"));
    node.y = Math.round(element.position("y"));
  }

  /** Redraws the diagram from `design` and refreshes every list that names nodes or edges. */
  function render(/** @type {{fit?: boolean}} */ options = {}) {
    cy.batch(() => {
      cy.elements().remove();
      cy.add(diagram.elements({ nodes: design.nodes, connections: design.connections }));
    });
    diagram.markProblems(cy, problems);
    if (selectedNode) cy.getElementById(selectedNode).select();
    if (selectedEdge) cy.getElementById(selectedEdge).select();
    if (options.fit && design.nodes.length) cy.fit(undefined, 30);
    refreshLists();
  }

  // -- lookups ------------------------------------------------------------------------------

  function nodeOf(/** @type {string|null} */ key) {
    return design.nodes.find((n) => n.id === key) || null;
  }

  function edgeOf(/** @type {string|null} */ id) {
    return design.connections.find((c) => diagram.edgeId(c) === id) || null;
  }

  function title(/** @type {any} */ node) {
    return node ? node.name || node.stateCode || node.id : "?";
  }

  function problemsOf(/** @type {{node?: string, edge?: string}} */ what) {
    return problems.filter((p) =>
      what.edge ? p.edge && diagram.edgeId(p.edge) === what.edge : !p.edge && p.node === what.node,
    );
  }

  // -- lists of nodes and edges -------------------------------------------------------------

  function fill(/** @type {HTMLSelectElement} */ select, /** @type {[string, string][]} */ options, /** @type {string} */ chosen) {
    select.replaceChildren(
      ...options.map(([value, text]) => {
        const option = document.createElement("option");
        option.value = value;
        option.textContent = text;
        option.selected = value === chosen;
        return option;
      }),
    );
  }

  function refreshLists() {
    /** @type {[string, string][]} */
    const nodes = design.nodes.map((n) => {
      const count = problemsOf({ node: n.id }).length;
      return [n.id, title(n) + " (" + n.type + ")" + (count ? " ⚠ " + count + " problem" + (count > 1 ? "s" : "") : "")];
    });
    fill(byId("node-select"), [["", "Choose a node"], ...nodes], selectedNode || "");
    const from = byId("connect-from").value;
    const to = byId("connect-to").value;
    fill(byId("connect-from"), design.nodes.map((n) => [n.id, title(n) + " (" + n.type + ")"]), from);
    fill(byId("connect-to"), design.nodes.map((n) => [n.id, title(n) + " (" + n.type + ")"]), to);
    /** @type {[string, string][]} */
    const edges = design.connections.map((c) => {
      const id = diagram.edgeId(c);
      const count = problemsOf({ edge: id }).length;
      const label = c.label ? ": " + c.label : c.conditionResult ? ": " + c.conditionResult : "";
      return [id, title(nodeOf(c.source)) + " → " + title(nodeOf(c.target)) + label + (count ? " ⚠" : "")];
    });
    fill(byId("edge-select"), [["", "Choose a transition"], ...edges], selectedEdge || "");
    byId("state-codes").replaceChildren(
      ...design.stateChoices.map((code) => Object.assign(document.createElement("option"), { value: code })),
    );
  }

  function fillPredicates() {
    /** @type {[string, string][]} */
    const names = data.conditions.map((/** @type {string} */ name) => [name, name]);
    fill(byId("node-condition"), [["", "none chosen"], ...names], "");
    fill(byId("edge-guard"), [["", "no guard"], ...names], "");
  }

  // -- the template's own fields --------------------------------------------------------------

  function splitList(/** @type {string} */ text) {
    return text.split(/[\n,]/).map((part) => part.trim()).filter(Boolean);
  }

  byId("design-name").value = design.name || "";
  byId("design-description").value = design.description || "";
  byId("design-states").value = (design.stateChoices || []).join(", ");
  byId("design-forbid-self").checked = Boolean(design.forbidSelfApproval);
  byId("design-forbid-self").addEventListener("change", (/** @type {any} */ e) => { design.forbidSelfApproval = e.target.checked; });
  byId("design-submitters").value = design.submitters || "any";
  byId("design-submitters").addEventListener("change", (/** @type {any} */ e) => { design.submitters = e.target.value; });
  design.stateChoices = design.stateChoices || [];
  byId("design-name").addEventListener("input", (/** @type {any} */ e) => { design.name = e.target.value; });
  byId("design-description").addEventListener("input", (/** @type {any} */ e) => { design.description = e.target.value; });
  byId("design-states").addEventListener("input", (/** @type {any} */ e) => {
    design.stateChoices = splitList(e.target.value);
    refreshLists();
  });

  // -- nodes ------------------------------------------------------------------------------------

  function newKey(/** @type {string} */ type) {
    let number = design.nodes.length + 1;
    while (nodeOf(type + "-" + number)) number += 1;
    return type + "-" + number;
  }

  byId("add-node").addEventListener("click", () => {
    const type = byId("add-type").value;
    const lowest = design.nodes.reduce((y, n) => Math.max(y, Number(n.y) || 0), -Infinity);
    /** @type {any} */
    const node = {
      id: newKey(type),
      type,
      name: byId("add-name").value.trim(),
      x: FIRST_PLACE.x,
      y: lowest === -Infinity ? FIRST_PLACE.y : lowest + NODE_GAP,
    };
    if (type === "state") Object.assign(node, { stateCode: "", threshold: "single", assigneeUserIds: [], assigneeGroupIds: [] });
    design.nodes.push(node);
    byId("add-name").value = "";
    selectedNode = node.id;
    render({ fit: true });
    showNode();
    status("Added " + title(node) + " (" + type + ").");
  });

  function selectNode(/** @type {string|null} */ key) {
    selectedNode = key || null;
    selectedEdge = null;
    cy.elements().unselect();
    if (selectedNode) cy.getElementById(selectedNode).select();
    refreshLists();
    showNode();
    showEdge();
  }

  function showNode() {
    const node = nodeOf(selectedNode);
    byId("node-editor").hidden = !node;
    if (!node) return;
    byId("node-key").textContent = node.id;
    byId("node-type").textContent = node.type;
    for (const part of byId("node-editor").querySelectorAll("[data-types]")) {
      part.hidden = !part.dataset.types.split(" ").includes(node.type);
    }
    for (const input of byId("node-editor").querySelectorAll("[data-field]")) {
      const value = node[input.dataset.field];
      input.value = Array.isArray(value) ? value.join(", ") : value == null ? "" : String(value);
    }
    if (node.type === "state" && !node.threshold) byId("node-threshold").value = "single";
    listProblems(byId("node-problems"), problemsOf({ node: node.id }));
  }

  byId("node-select").addEventListener("change", (/** @type {any} */ e) => selectNode(e.target.value));

  for (const input of byId("node-editor").querySelectorAll("[data-field]")) {
    input.addEventListener(input.tagName === "SELECT" ? "change" : "input", () => {
      const node = nodeOf(selectedNode);
      if (!node) return;
      const field = input.dataset.field;
      if (input.dataset.list) node[field] = splitList(input.value);
      else if (field === "x" || field === "y") node[field] = Number(input.value) || 0;
      else if (input.dataset.number) node[field] = input.value === "" ? null : Math.round(Number(input.value));
      else node[field] = input.value === "" && field !== "name" ? null : input.value;
      render();
    });
  }

  byId("delete-node").addEventListener("click", () => {
    const node = nodeOf(selectedNode);
    if (!node) return;
    design.nodes = design.nodes.filter((n) => n !== node);
    design.connections = design.connections.filter((c) => c.source !== node.id && c.target !== node.id);
    selectedNode = null;
    render({ fit: true });
    showNode();
    byId("node-select").focus();
    status("Deleted " + title(node) + " and its transitions.");
  });

  // -- edges --------------------------------------------------------------------------------------

  byId("connect").addEventListener("click", () => {
    const source = byId("connect-from").value;
    const target = byId("connect-to").value;
    if (!source || !target || source === target) {
      status("Choose two different nodes to connect.");
      return;
    }
    if (edgeOf(diagram.edgeId({ source, target }))) {
      status("These two nodes are connected already: edit that transition instead.");
      return;
    }
    /** @type {any} */
    const connection = { source, target, label: byId("connect-label").value.trim() };
    let result = byId("connect-result").value;
    if (!result && nodeOf(source)?.type === "condition") {
      // A condition needs a true and a false edge: the first one missing.
      const taken = design.connections.filter((c) => c.source === source).map((c) => c.conditionResult);
      result = taken.includes("true") ? "false" : "true";
    }
    if (result) connection.conditionResult = result;
    design.connections.push(connection);
    byId("connect-label").value = "";
    byId("connect-result").value = "";
    render();
    status("Connected " + title(nodeOf(source)) + " to " + title(nodeOf(target)) + ".");
  });

  function selectEdge(/** @type {string|null} */ id) {
    selectedEdge = id || null;
    selectedNode = null;
    cy.elements().unselect();
    if (selectedEdge) cy.getElementById(selectedEdge).select();
    refreshLists();
    showNode();
    showEdge();
  }

  function showEdge() {
    const edge = edgeOf(selectedEdge);
    byId("edge-editor").hidden = !edge;
    if (!edge) return;
    for (const input of byId("edge-editor").querySelectorAll("[data-field]")) {
      const value = edge[input.dataset.field];
      if (input.type === "checkbox") input.checked = Boolean(value);
      else input.value = value == null ? "" : String(value);
    }
    listProblems(byId("edge-problems"), problemsOf({ edge: selectedEdge || "" }));
  }

  byId("edge-select").addEventListener("change", (/** @type {any} */ e) => selectEdge(e.target.value));

  for (const input of byId("edge-editor").querySelectorAll("[data-field]")) {
    input.addEventListener(input.type === "checkbox" || input.tagName === "SELECT" ? "change" : "input", () => {
      const edge = edgeOf(selectedEdge);
      if (!edge) return;
      const field = input.dataset.field;
      if (input.type === "checkbox") edge[field] = input.checked;
      else edge[field] = input.value === "" && field !== "label" ? null : input.value;
      render();
    });
  }

  byId("delete-edge").addEventListener("click", () => {
    const edge = edgeOf(selectedEdge);
    if (!edge) return;
    design.connections = design.connections.filter((c) => c !== edge);
    selectedEdge = null;
    render();
    showEdge();
    byId("edge-select").focus();
    status("Deleted the transition " + title(nodeOf(edge.source)) + " → " + title(nodeOf(edge.target)) + ".");
  });

  // -- save, problems and activation --------------------------------------------------------------

  function status(/** @type {string} */ text, /** @type {string|null} */ link = null, /** @type {string} */ linkText = "") {
    const place = byId("save-status");
    place.replaceChildren(document.createTextNode(text));
    if (link) {
      place.append(" ", Object.assign(document.createElement("a"), { href: link, textContent: linkText }));
    }
  }

  /** Shows problems as buttons that select what they name. */
  function listProblems(/** @type {HTMLElement} */ list, /** @type {any[]} */ shown) {
    list.replaceChildren(
      ...shown.map((problem) => {
        const item = document.createElement("li");
        const button = Object.assign(document.createElement("button"), {
          type: "button",
          className: "problem-button",
          textContent: problem.message,
        });
        button.addEventListener("click", () => showProblem(problem));
        item.append(button);
        return item;
      }),
    );
  }

  function showProblem(/** @type {any} */ problem) {
    if (problem.edge) {
      selectEdge(diagram.edgeId(problem.edge));
      byId("edge-label").focus();
    } else if (problem.node) {
      selectNode(problem.node);
      byId("node-name").focus();
    } else {
      byId("design-name").focus();
      return;
    }
    const element = cy.getElementById(problem.edge ? diagram.edgeId(problem.edge) : problem.node);
    if (element.nonempty()) cy.center(element);
  }

  /** What a save sends: the designer JSON, positions as whole pixels. */
  function payload() {
    return {
      name: design.name,
      description: design.description || "",
      stateChoices: design.stateChoices,
      forbidSelfApproval: Boolean(design.forbidSelfApproval),
      submitters: design.submitters || "any",
      ...(design.baseTemplateId ? { baseTemplateId: design.baseTemplateId } : {}),
      nodes: design.nodes.map((n) => ({ ...n, x: Math.round(Number(n.x) || 0), y: Math.round(Number(n.y) || 0) })),
      connections: design.connections,
    };
  }

  /** The refusal of a save as a sentence: a 422's fields, or the detail. */
  function refusal(/** @type {any} */ body, /** @type {number} */ code) {
    if (Array.isArray(body.detail)) {
      return body.detail.map((/** @type {any} */ e) => (e.loc || []).slice(1).join(".") + ": " + e.msg).join("; ");
    }
    if (body.detail) return body.detail;
    // The console's write guard answers with a page, not JSON: a session or CSRF token gone.
    return "HTTP " + code + (code === 401 || code === 403 ? ": reload the page (log in again if asked), then save." : "");
  }

  byId("save-design").addEventListener("click", async () => {
    const activate = byId("activate-form");
    activate.hidden = true;
    if (!design.name || !design.name.trim()) {
      status("Give the template a name first.");
      byId("design-name").focus();
      return;
    }
    status("Saving…");
    const response = await fetch(data.saveUrl, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json", ...csrfHeaders() },
      body: JSON.stringify(payload()),
    });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      status("Not saved: " + refusal(body, response.status));
      return;
    }
    design.baseTemplateId = body.template_id; // the next save starts from this version
    problems = body.problems || [];
    render();
    showNode();
    showEdge();
    byId("problems").hidden = problems.length === 0;
    listProblems(byId("problem-list"), problems);
    if (problems.length) {
      status("Saved version " + body.version + " with " + problems.length + " problem" + (problems.length > 1 ? "s" : "") + ": it cannot be activated until they are fixed.", body.template_url, "View version " + body.version);
    } else {
      status("Saved version " + body.version + ", valid.", body.template_url, "View version " + body.version);
      activate.action = body.activate_url;
      byId("activate-version").textContent = "Activate version " + body.version;
      activate.hidden = false;
    }
  });

  // -- start --------------------------------------------------------------------------------------

  fillPredicates();
  refreshLists();
  showNode();
  showEdge();
})();
