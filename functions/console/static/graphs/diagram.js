// @ts-check
/**
 * Draws a graph template with Cytoscape: the designer's JSON (nodes and connections) in,
 * a diagram out. Shared by the template, instance and designer pages.
 *
 * Each node type has its own shape and colour and is labelled: a state with its code and
 * approval threshold, a condition with its predicate. Nodes sit where the stored designer
 * layout put them while it still matches the graph (`data.preset`, decided by the server:
 * the same nodes and edges as when it was saved); otherwise cytoscape-dagre lays the graph
 * out top to bottom.
 * An instance's page adds marks: where each branch stands, what was visited, which edges
 * were taken. Validation problems mark the nodes and edges they name.
 *
 * Elements are named by the designer's keys: a node by its `id`, an edge by
 * "source->target" (one transition per pair).
 *
 * @typedef {{id: string, type: string, name?: string, x?: number, y?: number,
 *   stateCode?: string|null, threshold?: string|null, condition?: string|null,
 *   assigneeUserIds?: string[], assigneeGroupIds?: string[], deadlineSeconds?: number|null}} DesignNode
 * @typedef {{source: string, target: string, label?: string, conditionResult?: string|null,
 *   commentRequired?: boolean, escalation?: boolean, condition?: string|null}} DesignConnection
 * @typedef {{code: string, message: string, node: string|null,
 *   edge: {source: string, target: string}|null}} Problem
 * @typedef {{nodes: DesignNode[], connections: DesignConnection[], preset?: boolean,
 *   problems?: Problem[], visited?: string[], current?: Object<string, number[]>,
 *   trail?: string[][]}} DiagramData
 */
(function () {
  "use strict";

  /** @type {any} */
  const cytoscape = /** @type {any} */ (window).cytoscape;
  const PADDING = 30; // pixels around the graph
  const MIN_HEIGHT = 320; // pixels of a diagram, at least
  const MAX_HEIGHT = 1400;

  /** What a node of each type looks like: shape, size, colours, where its label sits. */
  const LOOKS = {
    start: { shape: "ellipse", width: 40, height: 40, fill: "#15803d", line: "#14532d", inside: false },
    state: { shape: "round-rectangle", width: 170, height: 62, fill: "#dbeafe", line: "#1d4ed8", inside: true },
    condition: { shape: "diamond", width: 150, height: 84, fill: "#fef3c7", line: "#b45309", inside: true },
    fork: { shape: "rectangle", width: 150, height: 14, fill: "#6d28d9", line: "#4c1d95", inside: false },
    join: { shape: "rectangle", width: 150, height: 14, fill: "#6d28d9", line: "#4c1d95", inside: false },
    end: { shape: "ellipse", width: 40, height: 40, fill: "#1f2937", line: "#9ca3af", inside: false },
  };

  /** The id Cytoscape knows an edge by. */
  function edgeId(/** @type {{source: string, target: string}} */ pair) {
    return pair.source + "->" + pair.target;
  }

  /** A node's label: its name, then what the type adds (code and threshold, predicate). */
  function nodeLabel(/** @type {DesignNode} */ node) {
    const name = node.name || node.stateCode || node.id;
    switch (node.type) {
      case "state": {
        const code = node.stateCode || "no code";
        const people = (node.assigneeUserIds || []).concat((node.assigneeGroupIds || []).map((g) => "@" + g));
        return name + "\n" + code + " · " + (node.threshold || "single") + (people.length ? "\n" + people.join(", ") : "");
      }
      case "condition":
        return name + "\n" + (node.condition ? node.condition + "?" : "no predicate");
      case "fork":
      case "join":
        return node.type + ": " + name;
      case "end":
        return name + (node.stateCode ? " (" + node.stateCode + ")" : "");
      default:
        return name;
    }
  }

  /** An edge's label: its own, the condition result, and marks for a comment or an escalation. */
  function edgeLabel(/** @type {DesignConnection} */ connection) {
    const parts = [];
    if (connection.escalation) parts.push("⏱");
    if (connection.label) parts.push(connection.label);
    if (connection.conditionResult) parts.push(String(connection.conditionResult));
    if (connection.commentRequired) parts.push("(comment)");
    return parts.join(" ");
  }

  /** Cytoscape elements for a design: nodes at their stored place, edges by key pair. */
  function elements(/** @type {DiagramData} */ data) {
    const known = new Set(data.nodes.map((n) => n.id));
    const nodes = data.nodes.map((node) => ({
      group: "nodes",
      data: { id: node.id, label: nodeLabel(node), type: node.type },
      position: { x: Number(node.x) || 0, y: Number(node.y) || 0 },
      classes: node.type,
    }));
    const edges = data.connections
      .filter((c) => known.has(c.source) && known.has(c.target))
      .map((c) => ({
        group: "edges",
        data: { id: edgeId(c), source: c.source, target: c.target, label: edgeLabel(c) },
        classes: c.escalation ? "escalation" : "",
      }));
    return [...nodes, ...edges];
  }

  /** The stylesheet: one rule per node type, then the marks. */
  function style() {
    /** @type {any[]} */
    const rules = [
      {
        selector: "node",
        style: {
          label: "data(label)",
          "text-wrap": "wrap",
          "text-max-width": 150,
          "font-size": 12,
          "font-family": "system-ui, sans-serif",
          color: "#111827",
          "border-width": 2,
        },
      },
    ];
    for (const [type, look] of Object.entries(LOOKS)) {
      rules.push({
        selector: "node." + type,
        style: {
          shape: look.shape,
          width: look.width,
          height: look.height,
          "background-color": look.fill,
          "border-color": look.line,
          "text-valign": look.inside ? "center" : "bottom",
          "text-margin-y": look.inside ? 0 : 5,
          "text-max-width": look.inside ? look.width - 16 : 180,
        },
      });
    }
    rules.push(
      { selector: "node.end", style: { "border-width": 5, "border-style": "double" } },
      {
        selector: "edge",
        style: {
          width: 2,
          "curve-style": "bezier",
          "line-color": "#6b7280",
          "target-arrow-color": "#6b7280",
          "target-arrow-shape": "triangle",
          label: "data(label)",
          "font-size": 11,
          "font-family": "system-ui, sans-serif",
          color: "#111827",
          "text-background-color": "#ffffff",
          "text-background-opacity": 1,
          "text-background-padding": 2,
        },
      },
      { selector: "edge.escalation", style: { "line-style": "dashed" } },
      { selector: ".faded", style: { opacity: 0.45 } },
      { selector: "node.visited", style: { "border-width": 4, "border-color": "#15803d" } },
      {
        selector: "node.current",
        style: { "border-width": 6, "border-color": "#dc2626", "border-style": "solid" },
      },
      {
        selector: "edge.trail",
        style: { width: 4, "line-color": "#15803d", "target-arrow-color": "#15803d" },
      },
      {
        selector: ".problem",
        style: { "border-color": "#b91c1c", "border-width": 5, "border-style": "dashed" },
      },
      {
        selector: "edge.problem",
        style: { "line-color": "#b91c1c", "target-arrow-color": "#b91c1c", "line-style": "dashed", width: 4 },
      },
      { selector: "node:selected", style: { "overlay-color": "#2563eb", "overlay-opacity": 0.25, "overlay-padding": 6 } },
      { selector: "edge:selected", style: { "overlay-color": "#2563eb", "overlay-opacity": 0.25, "overlay-padding": 4 } },
    );
    return rules;
  }

  /** How the diagram is laid out: the stored places, or dagre top to bottom. */
  function layoutOptions(/** @type {boolean} */ preset) {
    return preset
      ? { name: "preset", fit: true, padding: PADDING }
      : { name: "dagre", rankDir: "TB", nodeSep: 40, rankSep: 60, edgeSep: 10, fit: true, padding: PADDING };
  }

  /**
   * Gives the diagram the height that shows the whole graph at (up to) full size, so labels
   * stay readable however tall the graph is (never less than the stylesheet's height).
   */
  function sizeToGraph(/** @type {any} */ cy, /** @type {HTMLElement} */ container) {
    const box = cy.elements().boundingBox();
    if (!box.w || !box.h) return;
    const zoom = Math.min(1, (container.clientWidth - 2 * PADDING) / box.w);
    const height = Math.round(box.h * zoom + 2 * PADDING);
    const least = Math.max(MIN_HEIGHT, container.clientHeight); // the stylesheet's height at least
    container.style.height = Math.max(least, Math.min(MAX_HEIGHT, height)) + "px";
    cy.resize();
    cy.fit(undefined, PADDING);
  }

  /** Marks the elements validation problems name (and unmarks the others). */
  function markProblems(/** @type {any} */ cy, /** @type {Problem[]} */ problems) {
    cy.elements().removeClass("problem");
    for (const problem of problems || []) {
      if (problem.edge) cy.getElementById(edgeId(problem.edge)).addClass("problem");
      else if (problem.node) cy.getElementById(problem.node).addClass("problem");
    }
  }

  /** Marks an instance: its branches' nodes, the visited nodes, the edges taken. */
  function markInstance(/** @type {any} */ cy, /** @type {DiagramData} */ data) {
    if (!data.visited) return;
    const visited = new Set(data.visited);
    const trail = new Set((data.trail || []).map((pair) => edgeId({ source: pair[0], target: pair[1] })));
    cy.nodes().forEach((/** @type {any} */ node) => {
      node.addClass(visited.has(node.id()) ? "visited" : "faded");
    });
    cy.edges().forEach((/** @type {any} */ edge) => {
      edge.addClass(trail.has(edge.id()) ? "trail" : "faded");
    });
    for (const [key, numbers] of Object.entries(data.current || {})) {
      const node = cy.getElementById(key);
      node.removeClass("faded").addClass("current");
      node.data("label", node.data("label") + "\n● branch " + numbers.join(", "));
    }
  }

  /**
   * Draws `data` in `container`; the Cytoscape instance.
   * @param {HTMLElement} container
   * @param {DiagramData} data
   * @param {{editable?: boolean}} [options]
   */
  function draw(container, data, options) {
    const editable = Boolean(options && options.editable);
    const preset = data.preset !== false || data.nodes.length === 0;
    const cy = cytoscape({
      container,
      elements: elements(data),
      style: style(),
      layout: layoutOptions(preset),
      autoungrabify: !editable,
      autounselectify: !editable,
      boxSelectionEnabled: false,
      userZoomingEnabled: false,
      minZoom: 0.3,
      maxZoom: 1.2,
    });
    sizeToGraph(cy, container);
    markInstance(cy, data);
    markProblems(cy, data.problems || []);
    return cy;
  }

  /** @type {any} */ (window).dulyDiagram = {
    draw,
    elements,
    style,
    layoutOptions,
    markProblems,
    edgeId,
    nodeLabel,
    edgeLabel,
  };

  /**
   * Draws every read-only diagram under `root` not drawn yet (an element naming its data with
   * data-diagram).
   * @param {ParentNode} root
   */
  function drawAll(root) {
    for (const container of root.querySelectorAll("[data-diagram]")) {
      if (/** @type {any} */ (container).cy) continue;
      const source = document.getElementById(/** @type {HTMLElement} */ (container).dataset.diagram || "");
      if (!source) continue;
      const cy = draw(/** @type {HTMLElement} */ (container), JSON.parse(source.textContent || "{}"));
      /** @type {any} */ (container).cy = cy; // for the browser tests and the curious
    }
  }

  drawAll(document);
  // A live fragment redrawn by htmx (an instance that moved) brings its diagram anew.
  document.addEventListener("htmx:load", (event) => {
    const element = /** @type {any} */ (event).detail && /** @type {any} */ (event).detail.elt;
    if (element && element.querySelectorAll) drawAll(element);
  });
})();
